"""runner's Hydra configuration, shipped as the ``runner.conf`` package resource."""
