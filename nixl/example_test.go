package nixl_test

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/gonixl/gonixl/nixl"
)

// Two agents in one process: the initiator READs the target's registered buffer over UCX and the target
// gets the transfer's notification.
func Example() {
	lib, err := nixl.Load(nixl.LoadOptions{}) // $NIXL_LIB_DIR, the loader's path, then StandardPaths
	if err != nil {
		fmt.Println(err)
		return
	}
	ucx := []nixl.BackendSpec{{Plugin: "UCX"}}
	target, _ := lib.NewAgent("example-target", nixl.AgentConfig{Backends: ucx})
	defer target.Close()
	init, _ := lib.NewAgent("example-init", nixl.AgentConfig{Backends: ucx})
	defer init.Close()

	src, _ := nixl.AllocHost(1<<20, nixl.HostOptions{})
	defer src.Close()
	dst, _ := nixl.AllocHost(1<<20, nixl.HostOptions{})
	defer dst.Close()
	copy(src.Bytes(), "hello from the target")

	tr, _ := target.RegisterMem(nixl.DRAM, []nixl.Desc{src.Desc()})
	defer tr.Close()
	ir, _ := init.RegisterMem(nixl.DRAM, []nixl.Desc{dst.Desc()})
	defer ir.Close()

	md, _ := target.LocalMetadata() // shipped to the initiator by the application (vLLM: over ZMQ)
	peer, _ := init.LoadRemoteMetadata(md)

	x, err := init.CreateXfer(nixl.Read, nixl.DRAM, []nixl.Desc{dst.Desc()}, nixl.DRAM, []nixl.Desc{src.Desc()}, peer,
		nixl.WithNotification([]byte("req-42:1")))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer x.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := x.Post(); err != nil {
		fmt.Println(err)
		return
	}
	if err := x.Wait(ctx); err != nil {
		fmt.Println(err)
		return
	}
	n, _ := target.WaitNotification(ctx, func(nixl.Notification) bool { return true }, nil)
	fmt.Println(string(bytes.TrimRight(dst.Bytes()[:32], "\x00")))
	fmt.Printf("%s notified: %s\n", n.Agent, n.Msg)
	// Output:
	// hello from the target
	// example-init notified: req-42:1
}

// Loading NIXL with the LIBFABRIC plugin's libraries from a folder (`make fabric-deps` fills one), without
// LD_LIBRARY_PATH: they are preloaded before NIXL, and the plugin's dependencies resolve to them.
func ExampleLoadOptions_depDirs() {
	lib, err := nixl.Load(nixl.LoadOptions{DepDirs: []string{"/root/.cache/gonixl/fabric-deps-cu12/lib"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range lib.Deps() {
		fmt.Println(d.Soname, d.Err) // Err is "" for each library loaded
	}
	a, err := lib.NewAgent("fabric-example", nixl.AgentConfig{Backends: []nixl.BackendSpec{{Plugin: "LIBFABRIC"}}})
	if err != nil {
		fmt.Println(err) // e.g. FI_PROVIDER unset, or no interface for libfabric's tcp provider
		return
	}
	defer a.Close()
}
