"""Gradio widget of this metric: the `app_file` of its Hugging Face Space (see README.md)."""

from pathlib import Path

import evaluate
from evaluate.utils import launch_gradio_widget

launch_gradio_widget(evaluate.load(str(Path(__file__).with_name("nll.py"))))
