package connector

import (
	"maps"
	"net"
	"slices"
	"strings"

	"github.com/gonixl/gonixl/nixl"
)

// AllDataDevices, as RoleConfig.DataDevice, lets NIXL's UCX backend use every
// network device (UCX's own default): its TCP transport then listens on every interface, and the agent
// metadata that the side channel hands to anyone who asks names all of them.
const AllDataDevices = "all"

// ucxEngineConfig is the UCX backend's init parameter carrying UCX settings for that backend's context only
// ("KEY=VALUE,KEY=VALUE", each applied as UCX_KEY unless that environment variable is set). NET_DEVICES
// through it takes one device: the list separator is the pair separator. (NIXL's "device_list" parameter
// appends ":1" to every name, for RDMA ports, so it cannot name "lo" or "eth0".)
const ucxEngineConfig = "engine_config"

// DataDeviceFor returns the UCX network device that keeps the NIXL data plane where an address listens: the
// loopback interface ("lo") for a loopback address (127.0.0.0/8, ::1, "localhost"), else "" (no restriction:
// a routable side channel usually goes with RDMA devices, which only the operator can name). The prefill role
// applies it to its side-channel host when RoleConfig.DataDevice is not set.
func DataDeviceFor(host string) string {
	ip := net.ParseIP(strings.Trim(host, "[]"))
	if host == "localhost" {
		ip = net.IPv4(127, 0, 0, 1)
	}
	if ip == nil || !ip.IsLoopback() {
		return ""
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 {
			return ifc.Name
		}
	}
	return ""
}

// resolveDataDevice turns a role's DataDevice setting into the device to apply ("" for none): explicit as
// given, AllDataDevices as none, unset as DataDeviceFor(host).
func resolveDataDevice(dev, host string) string {
	switch dev {
	case AllDataDevices:
		return ""
	case "":
		return DataDeviceFor(host)
	}
	return dev
}

// withDataDevice returns backends with the UCX backend restricted to dev through its engine_config (unless
// dev is empty or the caller's engine_config already sets NET_DEVICES). The caller's specs are not modified.
func withDataDevice(backends []nixl.BackendSpec, dev string) []nixl.BackendSpec {
	if dev == "" {
		return backends
	}
	out := slices.Clone(backends)
	for i, b := range out {
		if !strings.EqualFold(b.Plugin, "UCX") {
			continue
		}
		cfg := b.Params[ucxEngineConfig]
		if strings.Contains(strings.ToUpper(cfg), "NET_DEVICES=") {
			continue
		}
		p := maps.Clone(b.Params)
		if p == nil {
			p = map[string]string{}
		}
		if cfg != "" {
			cfg += ","
		}
		p[ucxEngineConfig] = cfg + "NET_DEVICES=" + dev
		out[i].Params = p
	}
	return out
}
