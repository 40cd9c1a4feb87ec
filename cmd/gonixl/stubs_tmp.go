package main

import "context"

func runBench(ctx context.Context, env *cmdEnv, args []string) error { return nil }
