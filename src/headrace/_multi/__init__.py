"""Several streams: mix of loaders, rank sharding under a launcher, run()."""
