"""loaderx's spellings (Dataset, DataLoader), kept apart from headrace's own API."""
