"""Speculative decoding: proposers (n-gram prompt lookup, a draft model) and the lossless
acceptance rule the engine verifies their drafts with in one target forward."""
