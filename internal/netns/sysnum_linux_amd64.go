package netns

// setns(2): the syscall package's table for amd64 predates it.
const sysSetns = 308
