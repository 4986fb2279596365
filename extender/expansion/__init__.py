"""Node expansion for capacity-only failures (DESIGN §6): detect, build a Karpenter NodeClaim from a
template node, track claims in flight, and the worker that does it off the request path."""
