"""Shipping compositions between stores: OCI bundles, registry push and pull, signatures and
the signing policy, exports to other formats."""
