"""Remote storage: the object-store client, the local cache, manifests, links, pinned snapshots, remote stores."""
