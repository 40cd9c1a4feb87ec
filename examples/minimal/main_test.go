package main

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gonixl/gonixl/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun runs the example's whole flow against real NIXL for the oldest and the newest wire profile: it
// fails unless every byte arrived and the prefill freed the blocks on the decode's notification.
func TestRun(t *testing.T) {
	t.Setenv("NIXL_LIB_DIR", testenv.RequireNIXLLibDir(t))
	for _, v := range []string{"0.16.0", "0.33.0"} {
		t.Run(v, func(t *testing.T) {
			require.NoError(t, run(v, 40))
		})
	}
}
