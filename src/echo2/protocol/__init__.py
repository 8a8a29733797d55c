"""Wire protocol: typed, tagged, versioned messages and the weight manifest they carry (no torch)."""
