"""echo2: asynchronous RL post-training with a central learner and remote rollout workers."""

from echo2.protocol.release import RELEASE as __version__

__all__ = ["__version__"]
