//go:build linux && !amd64

package netns

import "syscall"

const sysSetns = syscall.SYS_SETNS
