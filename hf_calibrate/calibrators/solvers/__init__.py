"""Numerical solvers the methods fit with: strong-Wolfe L-BFGS with the manners of a long fit, vector scaling's Newton steps, the stacked linear-map problems, and one-vs-rest isotonic regression."""
