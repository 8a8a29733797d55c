"""verifiers environments echo2 ships as examples, each with its own data (no hub): a taskset
module verifiers' way (its Taskset subclass in `__all__`), named in a run config as
`[task] name = "verifiers"`, `environment = "echo2.envs.verifiers_examples.addition"`."""
