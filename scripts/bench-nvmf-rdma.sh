#!/usr/bin/env bash
# bench-nvmf-rdma: Strata's NVMe/RDMA target against the Linux kernel's own (nvmet-rdma), both under the
# kernel's NVMe/RDMA host and the same fio jobs, alternated in one soft-RoCE guest run (tests/lab/rdma-guest).
# Strata serves a 1 GiB memory namespace; nvmet a memory-backed null_blk of 1 GiB (no timer: it completes at
# once). The guest has two vCPUs (GUEST_CPUS) and Strata's executor runs on the second (TARGET_FLAGS), as a
# userspace target is deployed with a core of its own; on one vCPU it would share the core with fio and the
# emulated NIC, where the kernel's target runs in their contexts. TCG emulation: absolute figures are slow,
# the ratio in one run is the result.
#
#   RUNTIME=5 REPS=3 [JOBS="randread:4k:1 randread:4k:16 read:128k:4 write:128k:4"] [GUEST_CPUS=2]
#   [TARGET_FLAGS="--cpus 1"] scripts/bench-nvmf-rdma.sh
#
# Prints one line per job (median over REPS of each target, and their ratio), then a JSON object. The
# `host:` row runs Strata's own NVMe/RDMA host (`strata-bench --ioengine=nvmf`) on nvmet-rdma beside the
# kernel's host under fio, same job; then a `--verify=crc32c` pass of Strata's host there.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${RUNTIME:-5}
REPS=${REPS:-3}
JOBS=${JOBS:-"randread:4k:1 randread:4k:16 read:128k:4 write:128k:4"}
TARGET_FLAGS=${TARGET_FLAGS:---cpus 1}
export STRATA_RDMA_GUEST_CPUS=${GUEST_CPUS:-2}

cargo build --release -q -p strata-tools --features rdma --bin strata-pool --bin strata-bench
script=$(mktemp)
log=$(mktemp)
trap 'rm -f "$script" "$log"' EXIT
cat >"$script" <<EOF
set -e
ours=nqn.2026-12.io.strata:bench-ours
theirs=nqn.2026-12.io.strata:bench-kernel
modprobe null_blk nr_devices=1 gb=1 bs=4096 memory_backed=1 irqmode=0 queue_mode=2
modprobe nvmet-rdma
config=/sys/kernel/config/nvmet
mkdir \$config/subsystems/\$theirs \$config/subsystems/\$theirs/namespaces/1 \$config/ports/1
echo 1 >\$config/subsystems/\$theirs/attr_allow_any_host
echo -n /dev/nullb0 >\$config/subsystems/\$theirs/namespaces/1/device_path
echo 1 >\$config/subsystems/\$theirs/namespaces/1/enable
echo rdma >\$config/ports/1/addr_trtype; echo ipv4 >\$config/ports/1/addr_adrfam
echo 10.0.2.15 >\$config/ports/1/addr_traddr; echo 4422 >\$config/ports/1/addr_trsvcid
ln -s \$config/subsystems/\$theirs \$config/ports/1/subsystems/\$theirs
strata-pool target --listen 127.0.0.1:4420 --listen rdma:10.0.2.15:4421 --subsystem \$ours \
  --namespace memory:1GiB $TARGET_FLAGS >/tmp/target.log 2>&1 &
sleep 3
nvme connect -t rdma -a 10.0.2.15 -s 4421 -n \$ours >/dev/null
nvme connect -t rdma -a 10.0.2.15 -s 4422 -n \$theirs >/dev/null
sleep 2
# The namespace's block device (not a multipath controller path, nvmeXcYnZ).
device_of() { for block in /sys/block/nvme*; do
  case \${block##*/} in *c*) continue ;; esac
  if [ "\$(cat \$block/device/subsysnqn)" = "\$1" ]; then echo /dev/\${block##*/}; fi; done; }
strata=\$(device_of \$ours); kernel=\$(device_of \$theirs)
echo "devices strata=\$strata kernel=\$kernel"
# Both namespaces written once, so that reads find data, not holes.
for device in \$strata \$kernel; do
  fio --name=fill --filename=\$device --direct=1 --ioengine=libaio --rw=write --bs=1m --iodepth=4 \
    --size=256m --output-format=terse --terse-version=3 >/dev/null
done
for rep in \$(seq 1 $REPS); do
  for job in $JOBS; do
    rw=\${job%%:*}; rest=\${job#*:}; bs=\${rest%%:*}; depth=\${rest#*:}
    for target in strata kernel; do
      eval device=\\\$\$target
      fio --name=bench --filename=\$device --direct=1 --ioengine=libaio --rw=\$rw --bs=\$bs --iodepth=\$depth \
        --size=256m --runtime=$RUNTIME --time_based --output-format=terse --terse-version=3 >/tmp/fio.out
      awk -F';' -v job="\$job" -v target=\$target -v rep=\$rep \
        '{ printf "BENCH %s %s %s %s %s\n", job, target, rep, \$8 + \$49, \$7 + \$48 }' /tmp/fio.out
    done
  done
done
# Strata's own host on the kernel's target: the 4 KiB QD 16 job beside the kernel host's, and a verify pass.
theirs_address="trtype=rdma,traddr=10.0.2.15,trsvcid=4422,subnqn=\$theirs,ns=1"
for rep in \$(seq 1 $REPS); do
  strata-bench --name=host --ioengine=nvmf --filename=\$theirs_address --rw=randread --bs=4k --iodepth=16 \
    --size=256m --runtime=$RUNTIME --time_based --output-format=json >/tmp/host.json
  echo "BENCH host:randread:4k:16 strata \$rep \$(grep -m1 '"iops"' /tmp/host.json | tr -dc '0-9.') 0"
  fio --name=bench --filename=\$kernel --direct=1 --ioengine=libaio --rw=randread --bs=4k --iodepth=16 \
    --size=256m --runtime=$RUNTIME --time_based --output-format=terse --terse-version=3 >/tmp/fio.out
  awk -F';' -v rep=\$rep '{ printf "BENCH host:randread:4k:16 kernel %s %s %s\n", rep, \$8, \$7 }' /tmp/fio.out
done
strata-bench --name=verify --ioengine=nvmf --filename=\$theirs_address --rw=randwrite --bs=64k --iodepth=8 \
  --size=64m --verify=crc32c >/tmp/verify.out 2>&1 && echo "VERIFY ok" || { echo "VERIFY failed"; cat /tmp/verify.out; }
nvme disconnect -n \$ours >/dev/null; nvme disconnect -n \$theirs >/dev/null
EOF
tests/lab/rdma-guest run 1500 "$script" target/release/strata-pool target/release/strata-bench "$(command -v fio)" |
  tee "$log" >/dev/null
grep -h "VERIFY" "$log" || true
python3 - "$log" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) == 7 and parts[1] == "BENCH":
        _, _, job, target, _, iops, kib_s = parts
        rows.setdefault(job, {}).setdefault(target, []).append((float(iops), float(kib_s)))
result = {}
for job, targets in rows.items():
    strata = statistics.median(value[0] for value in targets.get("strata", [(0, 0)]))
    kernel = statistics.median(value[0] for value in targets.get("kernel", [(0, 0)]))
    ratio = strata / kernel if kernel else 0.0
    result[job] = {"strata_iops": strata, "kernel_iops": kernel, "ratio": round(ratio, 3),
                   "strata_runs": [value[0] for value in targets.get("strata", [])],
                   "kernel_runs": [value[0] for value in targets.get("kernel", [])]}
    print(f"{job:22} strata {strata:10.0f} IOPS   kernel {kernel:10.0f} IOPS   ratio {ratio:.2f}")
print(json.dumps(result))
if not rows:
    sys.exit("no BENCH lines from the guest")
EOF
