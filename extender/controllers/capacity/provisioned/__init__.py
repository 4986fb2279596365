"""Provisioned mode: the extender launches the VMs of pools that name a GPUNodeClass through the cloud's
compute API (leader only). Targets, the launch planner and compaction are Karpenter mode's; what differs is
who buys the instance.

As Karpenter splits a NodeClaim's lifecycle, four reconcilers share one ``cloud.Cloud``, the state of the
providers: each Provisioned pool's ``computingVendor`` (its TensorFusionCluster's, else the
``--computing-vendor`` file; see vendors.py), one provider per distinct vendor, each with its connection
test; a pool whose vendor fails has its condition ``NodeProvisionerReady`` False with the cloud's own message
(naming the cluster or file it came from) and gets nothing launched (claims being deleted still wait for
their VMs); providers no pool or claim uses any more are closed. They take turns, one pass at a time:

- ``launch``: the launch planner's launches, GPUNodeClaim then VM, the next offering or zone after a
  capacity error; the pools' condition;
- ``registration``: a claim's phase Pending -> Creating -> Bound, its Node's labels, the join timeout;
- ``termination``: the claim finalizer, terminating the VM of a claim being deleted;
- ``garbagecollection``: the orphan sweep, VMs tagged for this cluster that no claim owns.
"""
