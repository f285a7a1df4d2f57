"""The pure stages, each one typed value in and the next out: normalize, parse, sections, split, tokens, mint.

Their order is known in one place only: ``pipeline.runner.chunk_document``.
"""
