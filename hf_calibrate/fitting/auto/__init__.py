"""``method="auto"``: the method chosen by cross-fitted NLL (:mod:`.selection`), its logit candidates' scores, Neural Clamping under a budget and the head methods when named."""
