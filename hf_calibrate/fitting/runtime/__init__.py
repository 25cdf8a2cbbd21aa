"""The runtime every fit runs on: the Accelerate engine, a stream's first pass, faults raised on every process, the rows a pass collects, kept logits, and probing the base model."""
