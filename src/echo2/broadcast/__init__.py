"""Weight dissemination: manifests, chunk verification and (peer-assisted) transfer. No torch."""
