#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after scripts/gpu-fabric-bundle.sh built
# .gpu-fabric/bundle.tgz: gonixl over NIXL's LIBFABRIC backend (tcp provider, loopback) beside UCX, in one
# run. Writes env.log, roles.log, bench.log, demo.log to $OUT.
#   1. gonixl env: which plugins load (and what the others miss)
#   2. the connector's prefill/decode role tests over LIBFABRIC (GONIXL_TEST_LIBFABRIC=1: must load), tcp;
#      then FI_PROVIDER=shm (NIXL 1.5.1's plugin only takes cxi, efa, tcp or sockets: expect a skip)
#   3. gonixl bench, target and initiator in two processes, DRAM→DRAM: UCX (its default transports),
#      UCX over TCP on loopback (UCX_TLS=tcp,cuda_copy UCX_NET_DEVICES=lo), LIBFABRIC (tcp); one sweep
#   4. the disaggregated demo over LIBFABRIC and UCX: DRAM→VRAM host-buffered (-cache hostbuf: NIXL into
#      pinned DRAM, then one batched copy to GPU memory), DRAM→VRAM direct (-cache gpu; NIXL 1.5.1's
#      LIBFABRIC plugin serves VRAM only with the efa or cxi provider: expect its registration error), and
#      DRAM→DRAM
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
repo=$(pwd)
b=/tmp/gonixl-fabric
rm -rf "$b" && mkdir -p "$b" && tar xzf .gpu-fabric/bundle.tgz -C "$b"
nixl_dir=$(ls -d "$b"/nixl/cu13-*/lib | head -n 1)
export NIXL_LIB_DIR="$nixl_dir"
drv=$(ldconfig -p 2>/dev/null | grep -m1 'libcuda.so.1 ' | sed 's/.*=> //')
[ -n "$drv" ] || drv=$(ls /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 2>/dev/null | head -n 1)
export LD_LIBRARY_PATH="$b/fabric${drv:+:$(dirname "$drv")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FI_PROVIDER=tcp
G="$b/bin/gonixl"

{
  echo "== host"; uname -a; ldd --version | head -n 1; nproc
  nvidia-smi --query-gpu=name,pci.bus_id,memory.total,driver_version --format=csv
  echo "libcuda: ${drv:-none}"; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "libfabric: $(readelf -V "$b/fabric/libfabric.so.1" | grep -o 'FABRIC_1\.[0-9]*' | sort -uV | tail -n 1)"
  echo "== gonixl env"
  timeout 60 "$G" env --no-neuron-init
} >"$out/env.log" 2>&1
cat "$out/env.log"

# Loopback first (FI_TCP_IFACE=lo). Where the tcp provider cannot listen there (seen on a gVisor sandbox:
# fi_enable fails with EBADF), the plugin's default, the first tcp domain: this host's own interface
# address, which the kernel delivers locally (the GPU machine reaches nothing outside itself).
roles() {
  (cd "$repo/connector" && GONIXL_TEST_LIBFABRIC=1 timeout 150 "$b/bin/connector.test" -test.run 'TestRolesOverLIBFABRIC' \
    -test.v -test.count=1 -test.timeout 140s) 2>&1 | tee -a "$out/roles.log"
}
echo "== role tests over LIBFABRIC (tcp, FI_TCP_IFACE=lo)" | tee "$out/roles.log"
export FI_TCP_IFACE=lo
roles
if ! grep -q -- '^--- PASS: TestRolesOverLIBFABRIC' "$out/roles.log"; then
  unset FI_TCP_IFACE
  echo "== role tests over LIBFABRIC (tcp, the plugin's default interface)" | tee -a "$out/roles.log"
  roles
fi
echo "FI_TCP_IFACE=${FI_TCP_IFACE:-(unset)} for what follows" | tee -a "$out/roles.log"
echo "== the same with FI_PROVIDER=shm" | tee -a "$out/roles.log"
(cd "$repo/connector" && FI_PROVIDER=shm timeout 60 "$b/bin/connector.test" -test.run 'TestRolesOverLIBFABRIC' \
  -test.v -test.count=1 -test.timeout 50s) 2>&1 | tail -n 6 | tee -a "$out/roles.log"

sweep=(--block-sizes "${BLOCKS:-4KiB,64KiB,1MiB,4MiB}" --batch 1,32 --op READ,WRITE --iters "${ITERS:-200}" --point-time 1s --progress off)
bench() { # name, backend, extra env...
  local name=$1 be=$2; shift 2
  local port=$((7800 + RANDOM % 100))
  env "$@" timeout 120 "$G" bench --serve --once --backends "$be" --listen "127.0.0.1:$port" >"$out/serve-$name.log" 2>&1 &
  local srv=$!
  sleep 2
  echo "## $name" | tee -a "$out/bench.log"
  env "$@" timeout 110 "$G" bench --peer "127.0.0.1:$port" --backends "$be" "${sweep[@]}" 2>&1 | tee -a "$out/bench.log"
  wait "$srv"
}
echo "== gonixl bench, DRAM→DRAM, two processes" | tee "$out/bench.log"
bench ucx UCX
bench ucx-tcp UCX UCX_TLS=tcp,cuda_copy UCX_NET_DEVICES=lo
bench libfabric-tcp LIBFABRIC

echo "== demo" | tee "$out/demo.log"
for be in LIBFABRIC UCX; do
  for cache in hostbuf gpu dram; do
    echo "## demo -backends $be -cache $cache" | tee -a "$out/demo.log"
    timeout 150 "$b/bin/disagg" -backends "$be" -cache "$cache" -timeout 140s 2>&1 | grep -vE '^\s*\[[0-9]+/' | tee -a "$out/demo.log"
  done
done
