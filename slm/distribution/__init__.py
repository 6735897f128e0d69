"""Distribution: compositions as OCI artifacts (image layout bundles, registries), exports to
llama.cpp and PEFT, Ed25519 signatures.

Sits above compose/ and formats/ and below ops/: it knows wire formats and protocols; the store
transactions that receive a bundle live in slm/ops (like every other import).
"""
