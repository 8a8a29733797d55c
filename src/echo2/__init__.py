"""echo2: asynchronous RL post-training with a central learner and remote rollout workers."""

__version__ = "0.1.0"
