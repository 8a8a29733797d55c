"""The coordinator: worker registry, task leases, rollout buffer, staleness admission, rewards."""
