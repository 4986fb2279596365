"""Node lifecycle decisions shared by the provisioning modes: which empty nodes go, which stay."""
