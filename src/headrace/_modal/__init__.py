"""Modalities: image, text, audio and video decoding and the loaders that configure the engine for them."""
