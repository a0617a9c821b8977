"""The record store: on-disk format, codecs, snapshots, reader, writer, compaction, recovery, verify."""
