"""The mlxserving worker's runtime: the protocol loop (protocol.py) over
a backend (backend.py) that runs the models: torchrt, the torch backend's
own implementation of each model family, or mlxlm, models built from
mlx_lm. worker.py beside the package starts it (main.py); settings
arrive on the command line (settings.py), never from the environment.

Modules shared by both backends: errors, settings, params (the sampling
parameters' keys, token sets, logit adjustments), seqs (a sequence's
sampling state, common prefixes), stcheck (checks of checkpoint files).
"""
