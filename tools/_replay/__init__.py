"""Private parts of `t1-replay`: the run view, drift, alignment, state fold, trial view."""
