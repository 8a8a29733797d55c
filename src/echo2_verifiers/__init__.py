"""echo2's agent loop as a verifiers plugin: verifiers finds a harness by importing its id as a
top-level module (`HarnessConfig.id = "echo2_verifiers"`); the loop is
echo2.envs.verifiers_harness."""

from echo2.envs.verifiers_harness import Echo2Harness

__all__ = ["Echo2Harness"]
