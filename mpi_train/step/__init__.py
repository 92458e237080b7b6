"""How a rank computes its step: the precision of its forward and backward (precision.py), the clipping of the
gradient the optimizer applies (clipping.py) and the compiled graph that runs them (compiling.py)."""
