"""Sources: records for the engine, from a store, raw files, links, image and media folders."""
