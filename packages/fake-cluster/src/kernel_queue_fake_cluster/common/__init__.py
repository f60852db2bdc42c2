"""Pure code the wings share: objects as plain JSON, label and field selectors, pod conditions
and readiness, loopback address pools.

No wing imports another's internals for these: the API server, the node agent and the fake
Kueue each import them from here, and this package imports no wing (an import contract).
"""
