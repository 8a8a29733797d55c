"""The local launcher behind `echo2 run`: coordinator, learner and workers as child processes."""
