#!/bin/sh
# The microVM host's container entry (compose.yaml, microvm-host-1): makes the container's own
# cgroup mounts writable, so the sandbox can make a group per instance below them, then runs
# the host ("$@") with CAP_SYS_ADMIN gone from every set: only this remount uses it.
set -eu
# Docker mounts the container's cgroups read-only (each v1 controller, or the v2 hierarchy);
# a bind remount changes this mount's flag only: it still shows the container's own subtree.
for mount in $(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts); do
  mount -o remount,bind,rw "$mount"
done
# cgroup v2 (a private cgroup namespace): a cgroup with processes cannot hand controllers to
# children, so this process moves to a leaf first and the root delegates memory, cpu and pids.
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  mkdir -p /sys/fs/cgroup/init
  echo $$ > /sys/fs/cgroup/init/cgroup.procs
  echo "+memory +cpu +pids" > /sys/fs/cgroup/cgroup.subtree_control
fi
exec setpriv --inh-caps=-sys_admin --bounding-set=-sys_admin -- "$@"
