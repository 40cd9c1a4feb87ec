package main

import "context"

func runInspect(ctx context.Context, env *cmdEnv, args []string) error { return nil }
func runBench(ctx context.Context, env *cmdEnv, args []string) error   { return nil }
