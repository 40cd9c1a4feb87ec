// capi_check.c: a compile-time check of gx.h against NIXL's own C API header (wrapper.h of NIXL's Rust
// binding, src/bindings/rust/wrapper.h; scripts/check-nixl-capi.sh finds it for the pinned NIXL version).
// It is never linked: compiling it is the check. With GX_NIXL_TYPES, gx.h's handle, enum and struct names
// are NIXL's types, so every gx_api slot must have exactly the type of the function whose symbol fills it;
// gx.h's own copies of NIXL's structs must have NIXL's layout.
#include <stddef.h>
#include "wrapper.h"
#define GX_NIXL_TYPES 1
#include "../gx.h"

#define GX_SAME(slot, symbol)                                                                                  \
	_Static_assert(__builtin_types_compatible_p(__typeof__(((gx_api_t*)0)->slot), __typeof__(&symbol)),    \
		       "gx.h: gx_api." #slot " is not the type of NIXL's " #symbol);
GX_SYMBOLS(GX_SAME, GX_SAME)

struct gx_agent_config_copy { GX_AGENT_CONFIG_FIELDS };
struct gx_telemetry_copy { GX_TELEMETRY_FIELDS };
#define GX_LAYOUT(copy, nixl, field)                                                                           \
	_Static_assert(offsetof(struct copy, field) == offsetof(nixl, field) &&                                \
			       sizeof(((struct copy*)0)->field) == sizeof(((nixl*)0)->field),                          \
		       "gx.h: " #copy "." #field " is not where NIXL's " #nixl " has it");
_Static_assert(sizeof(struct gx_agent_config_copy) == sizeof(nixl_capi_agent_config_t), "gx.h: agent config size");
GX_LAYOUT(gx_agent_config_copy, nixl_capi_agent_config_t, enable_prog_thread)
GX_LAYOUT(gx_agent_config_copy, nixl_capi_agent_config_t, enable_listen_thread)
GX_LAYOUT(gx_agent_config_copy, nixl_capi_agent_config_t, listen_port)
GX_LAYOUT(gx_agent_config_copy, nixl_capi_agent_config_t, thread_sync)
GX_LAYOUT(gx_agent_config_copy, nixl_capi_agent_config_t, num_workers)
GX_LAYOUT(gx_agent_config_copy, nixl_capi_agent_config_t, pthr_delay_us)
GX_LAYOUT(gx_agent_config_copy, nixl_capi_agent_config_t, lthr_delay_us)
GX_LAYOUT(gx_agent_config_copy, nixl_capi_agent_config_t, capture_telemetry)
_Static_assert(sizeof(struct gx_telemetry_copy) == sizeof(struct nixl_capi_xfer_telemetry_s), "gx.h: telemetry size");
GX_LAYOUT(gx_telemetry_copy, struct nixl_capi_xfer_telemetry_s, start_time_us)
GX_LAYOUT(gx_telemetry_copy, struct nixl_capi_xfer_telemetry_s, post_duration_us)
GX_LAYOUT(gx_telemetry_copy, struct nixl_capi_xfer_telemetry_s, xfer_duration_us)
GX_LAYOUT(gx_telemetry_copy, struct nixl_capi_xfer_telemetry_s, total_bytes)
GX_LAYOUT(gx_telemetry_copy, struct nixl_capi_xfer_telemetry_s, desc_count)

// The enum values gonixl passes as ints (nixl.MemType, nixl.Op, ThreadSync.capi, the statuses of errors.go).
_Static_assert(NIXL_CAPI_MEM_DRAM == 0 && NIXL_CAPI_MEM_VRAM == 1 && NIXL_CAPI_MEM_BLOCK == 2 &&
		       NIXL_CAPI_MEM_OBJECT == 3 && NIXL_CAPI_MEM_FILE == 4,
	       "NIXL's memory types moved: update nixl.MemType");
_Static_assert(NIXL_CAPI_XFER_OP_READ == 0 && NIXL_CAPI_XFER_OP_WRITE == 1, "NIXL's transfer ops moved: update nixl.Op");
_Static_assert(NIXL_CAPI_THREAD_SYNC_NONE == 0 && NIXL_CAPI_THREAD_SYNC_STRICT == 1 && NIXL_CAPI_THREAD_SYNC_RW == 2,
	       "NIXL's thread sync modes moved: update ThreadSync.capi");
_Static_assert(NIXL_CAPI_SUCCESS == 0 && NIXL_CAPI_IN_PROG == 1 && NIXL_CAPI_ERROR_INVALID_PARAM == -1 &&
		       NIXL_CAPI_ERROR_BACKEND == -2 && NIXL_CAPI_ERROR_INVALID_STATE == -3 &&
		       NIXL_CAPI_ERROR_EXCEPTION == -4 && NIXL_CAPI_ERROR_NO_TELEMETRY == -5 &&
		       NIXL_CAPI_ERROR_NOT_FOUND == -6,
	       "NIXL's statuses moved: update nixl's status table (errors.go)");
