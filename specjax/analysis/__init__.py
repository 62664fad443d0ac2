"""Analytic models of speculative decoding, to set beside measured results."""
