"""OpenEnv environments echo2 ships as examples (`task.name = "openenv"`); each is an
`openenv.core` Environment, so it also runs under OpenEnv's own server (`python -m
echo2.envs.openenv_examples.serve`)."""
