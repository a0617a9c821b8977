"""Order: which record ids a batch holds, a pure function of (seed, epoch, position, rank, world)."""
