"""Packing: arrays, folders, text and files into a store, serially or fanned out on an executor."""
