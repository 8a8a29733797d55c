"""Broadcast lab: synthetic payloads, Linux network namespaces shaped with tc tbf, and worker /
learner processes driven over stdin/stdout, for the netns integration test and the benchmark."""
