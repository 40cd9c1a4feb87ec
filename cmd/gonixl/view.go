package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/gonixl/gonixl/connector/protocol"
)

// metaView is a NixlAgentMetadata as the CLI prints it (text and JSON): the wire fields plus what follows
// from them (one entry per registered region with its base address and length).
type metaView struct {
	EngineID           string         `json:"engine_id"`
	AgentName          string         `json:"nixl_agent_name,omitempty"`
	AgentNameError     string         `json:"nixl_agent_name_error,omitempty"`
	AgentMetadataBytes int            `json:"agent_metadata_bytes"`
	DeviceID           int64          `json:"device_id"`
	NumBlocks          int64          `json:"num_blocks"`
	BlockSize          int64          `json:"block_size"`
	BlockLens          []int64        `json:"block_lens"`
	BlockStrides       []int64        `json:"block_strides,omitempty"`
	KVCacheLayout      string         `json:"kv_cache_layout"`
	AttnBackendName    string         `json:"attn_backend_name,omitempty"`
	Extra              map[string]any `json:"extra,omitempty"` // fields of newer profiles that are set
	Regions            []regionView   `json:"regions"`
	TotalBytes         int64          `json:"total_bytes"`
	Warnings           []string       `json:"warnings,omitempty"`
	raw                protocol.AgentMetadata
}

type regionView struct {
	Index   int    `json:"index"`
	Base    string `json:"base"` // hex
	BaseInt uint64 `json:"base_addr"`
	Len     int64  `json:"len"`
	Blocks  int64  `json:"num_blocks"`
	Name    string `json:"name,omitempty"`
	MemType string `json:"mem_type,omitempty"`
	GroupID *int64 `json:"group_id,omitempty"`
}

func newMetaView(p protocol.Profile, m protocol.AgentMetadata) metaView {
	v := metaView{
		EngineID: m.EngineID, AgentMetadataBytes: len(m.AgentMetadata), DeviceID: m.DeviceID, NumBlocks: m.NumBlocks,
		BlockSize: m.BlockSize, BlockLens: m.BlockLens, BlockStrides: m.BlockStrides, KVCacheLayout: m.KVCacheLayout,
		AttnBackendName: m.AttnBackendName, raw: m,
	}
	if v.BlockLens == nil {
		v.BlockLens = []int64{}
	}
	if _, err := p.ParseLayoutName(m.KVCacheLayout); err != nil && m.KVCacheLayout != "" {
		v.Warnings = append(v.Warnings, err.Error())
	}
	n := len(m.KVCachesBaseAddr)
	if len(m.BlockLens) != n {
		v.Warnings = append(v.Warnings, fmt.Sprintf("%d block_lens for %d regions", len(m.BlockLens), n))
	}
	fields := map[string]bool{}
	for _, f := range p.Schema.Fields() {
		fields[f] = true
	}
	extra := map[string]any{}
	if fields["ssm_sizes"] && m.SSMSizes != [2]int64{} {
		extra["ssm_sizes"] = m.SSMSizes
	}
	if fields["physical_blocks_per_logical_kv_block"] && m.PhysicalBlocksPerLogicalKVBlock != 1 {
		extra["physical_blocks_per_logical_kv_block"] = m.PhysicalBlocksPerLogicalKVBlock
	}
	if fields["dcp_size"] && m.DCPSize != 1 {
		extra["dcp_size"] = m.DCPSize
	}
	if fields["pcp_size"] && m.PCPSize != 1 {
		extra["pcp_size"] = m.PCPSize
	}
	if m.PLEBlockLen != nil {
		extra["ple_block_len"] = *m.PLEBlockLen
	}
	if m.RegionMembers != nil {
		extra["region_members"] = m.RegionMembers
	}
	if m.PackedMemberLayouts != nil {
		extra["packed_member_layouts"] = m.PackedMemberLayouts
	}
	if len(extra) > 0 {
		v.Extra = extra
	}
	v.Regions = []regionView{}
	for i, base := range m.KVCachesBaseAddr {
		r := regionView{Index: i, Base: fmt.Sprintf("0x%x", base), BaseInt: base, Blocks: m.NumBlocks}
		if i < len(m.RegionNumBlocks) {
			r.Blocks = m.RegionNumBlocks[i]
		}
		per := int64(0)
		if i < len(m.BlockStrides) && m.BlockStrides[i] > 0 {
			per = m.BlockStrides[i]
		} else if i < len(m.BlockLens) {
			per = m.BlockLens[i]
		}
		if per > 0 && r.Blocks > 0 && per <= (1<<62)/r.Blocks {
			r.Len = per * r.Blocks
			if v.TotalBytes <= (1<<62)-r.Len {
				v.TotalBytes += r.Len
			}
		}
		if i < len(m.RegionNames) {
			r.Name = m.RegionNames[i]
		}
		if i < len(m.RegionMemTypes) {
			r.MemType = m.RegionMemTypes[i]
		}
		if i < len(m.RegionGroupIDs) {
			g := m.RegionGroupIDs[i]
			r.GroupID = &g
		}
		v.Regions = append(v.Regions, r)
	}
	return v
}

// print writes the metadata as indented text.
func (v metaView) print(w io.Writer, indent string) {
	f := func(k, format string, a ...any) { fmt.Fprintf(w, "%s%-22s %s\n", indent, k, fmt.Sprintf(format, a...)) }
	f("engine_id", "%s", v.EngineID)
	switch {
	case v.AgentName != "":
		f("NIXL agent", "%s (metadata blob %d bytes)", v.AgentName, v.AgentMetadataBytes)
	case v.AgentNameError != "":
		f("NIXL agent", "? (metadata blob %d bytes; %s)", v.AgentMetadataBytes, v.AgentNameError)
	default:
		f("NIXL agent metadata", "%d bytes", v.AgentMetadataBytes)
	}
	f("device_id", "%d", v.DeviceID)
	f("num_blocks", "%d", v.NumBlocks)
	f("block_size", "%d tokens", v.BlockSize)
	f("block_lens", "%s", compactInts(v.BlockLens))
	if len(v.BlockStrides) > 0 {
		f("block_strides", "%s", compactInts(v.BlockStrides))
	}
	f("kv_cache_layout", "%s", v.KVCacheLayout)
	if v.AttnBackendName != "" {
		f("attn_backend_name", "%s", v.AttnBackendName)
	}
	for _, k := range sortedKeys(v.Extra) {
		f(k, "%v", v.Extra[k])
	}
	f("regions", "%d, %s in all", len(v.Regions), humanBytes(v.TotalBytes))
	for _, r := range v.Regions {
		extra := ""
		if r.Name != "" {
			extra += " " + r.Name
		}
		if r.MemType != "" {
			extra += " " + r.MemType
		}
		if r.GroupID != nil {
			extra += fmt.Sprintf(" group=%d", *r.GroupID)
		}
		fmt.Fprintf(w, "%s  [%3d] base %#016x  len %-12d (%d blocks)%s\n", indent, r.Index, r.BaseInt, r.Len, r.Blocks, extra)
	}
	for _, wn := range v.Warnings {
		f("warning", "%s", wn)
	}
}

// compactInts prints a list, folding runs of one value: [32768 ×56].
func compactInts(xs []int64) string {
	if len(xs) == 0 {
		return "[]"
	}
	var parts []string
	for i := 0; i < len(xs); {
		j := i
		for j < len(xs) && xs[j] == xs[i] {
			j++
		}
		if j-i > 1 {
			parts = append(parts, fmt.Sprintf("%d ×%d", xs[i], j-i))
		} else {
			parts = append(parts, fmt.Sprint(xs[i]))
		}
		i = j
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
