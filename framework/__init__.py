"""Model hopper parallelism (MOP) for deep-learning model selection on Ray."""
