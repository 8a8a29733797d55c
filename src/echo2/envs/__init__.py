"""Multi-turn environments (no torch): the interface, the episode rules shared by workers (who
play episodes) and the coordinator (who replays them to compute rewards), and the games."""
