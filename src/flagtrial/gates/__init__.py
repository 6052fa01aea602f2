"""Static analysis of an engine's source: will a flag act on this GPU? (see analyze.py)"""
