package protocol

import (
	"fmt"
	"math"
)

// GetMetaMsg is vLLM's GET_META_MSG: a Python bytes object, so msgpack bin, never str.
const GetMetaMsg = "get_meta_msg"

// MaxRank bounds the pp/tp ranks we encode or accept (vLLM ranks are small ints; this keeps hostile requests
// from naming absurd ranks).
const MaxRank = 1 << 20

// Rank names one worker of an engine: its pipeline-parallel and tensor-parallel rank (the side channel serves
// and asks for a prefill rank; a decode worker uses its TP rank).
type Rank struct{ PP, TP int }

func (r Rank) String() string { return fmt.Sprintf("(pp %d, tp %d)", r.PP, r.TP) }

const objRequest = "side-channel request"

// MetaRequest is a decoded side-channel request.
type MetaRequest struct {
	Rank Rank
	// UnexpectedTag is true when the first element was not bin "get_meta_msg" (vLLM logs a warning and still
	// answers).
	UnexpectedTag bool
}

// EncodeRequest builds the metadata request D sends for rank r in this profile's framing.
func (p Profile) EncodeRequest(r Rank) ([]byte, error) {
	if r.PP < 0 || r.TP < 0 || r.PP > MaxRank || r.TP > MaxRank {
		return nil, invalid(objRequest, "", "rank %v out of range [0, %d]", r, MaxRank)
	}
	switch p.Framing {
	case FramingH2:
		if r.PP != 0 {
			return nil, fmt.Errorf("%w: framing H2 (vLLM %s) serves pp rank 0 only (asked for %v)", ErrUnsupported, p.Name, r)
		}
		w := newWriter()
		w.arrayLen(2)
		w.bin([]byte(GetMetaMsg))
		w.int(int64(r.TP))
		return w.bytes()
	case FramingH4:
		w := newWriter()
		w.arrayLen(3)
		w.bin([]byte(GetMetaMsg))
		w.int(int64(r.PP))
		w.int(int64(r.TP))
		return w.bytes()
	}
	return nil, fmt.Errorf("%w: profile %s has framing %v", ErrUnsupported, p.Name, p.Framing)
}

// DecodeRequest decodes a side-channel request of this profile's framing (the message frame after the
// ROUTER's identity and empty delimiter). Unlike vLLM's listener it returns an error for anything malformed
// instead of raising: wrong array length, a non-integer or out-of-range rank, trailing bytes.
func (p Profile) DecodeRequest(b []byte) (MetaRequest, error) {
	want := 3
	if p.Framing == FramingH2 {
		want = 2
	}
	r := newReader(b, objRequest)
	n, err := r.arrayLen("")
	if err != nil {
		return MetaRequest{}, err
	}
	if n != want {
		return MetaRequest{}, malformed(objRequest, "", "framing %v wants an array of %d elements, got %d", p.Framing, want, n)
	}
	var req MetaRequest
	c, err := r.peek("tag")
	if err != nil {
		return req, err
	}
	if tag, err := r.bin("tag"); err == nil {
		req.UnexpectedTag = string(tag) != GetMetaMsg
	} else if codeName(c) == "bin" {
		return req, err
	} else {
		if err := r.skip("tag", 0); err != nil {
			return req, err
		}
		req.UnexpectedTag = true
	}
	ranks := make([]int, want-1)
	for i := range ranks {
		v, err := r.int64("rank")
		if err != nil {
			return req, err
		}
		if v < 0 || v > MaxRank {
			return req, malformed(objRequest, "rank", "rank %d out of range [0, %d]", v, MaxRank)
		}
		ranks[i] = int(v)
	}
	if err := r.end(); err != nil {
		return req, err
	}
	if want == 2 {
		req.Rank = Rank{TP: ranks[0]}
	} else {
		req.Rank = Rank{PP: ranks[0], TP: ranks[1]}
	}
	return req, nil
}

// ReplyFrames returns the frames the server sends after the identity and empty delimiter: [payload], or
// [payload, msgpack float64(clock)] in framing H4 (clock = the server's monotonic clock in seconds).
func (p Profile) ReplyFrames(payload []byte, clock float64) ([][]byte, error) {
	if p.Framing != FramingH4 {
		return [][]byte{payload}, nil
	}
	ts, err := encodeClock(clock)
	if err != nil {
		return nil, err
	}
	return [][]byte{payload, ts}, nil
}

// Reply is a decoded side-channel reply.
type Reply struct {
	Payload []byte
	// Clock is the server's monotonic clock (H4 only; HasClock says whether there was one).
	Clock    float64
	HasClock bool
}

// DecodeReply checks the frame count of a reply (what D's REQ socket receives) and decodes the clock frame.
func (p Profile) DecodeReply(frames [][]byte) (Reply, error) {
	want := 1
	if p.Framing == FramingH4 {
		want = 2
	}
	if len(frames) != want {
		return Reply{}, malformed("side-channel reply", "", "framing %v wants %d frames, got %d", p.Framing, want, len(frames))
	}
	rep := Reply{Payload: frames[0]}
	if want == 2 {
		c, err := decodeClock(frames[1])
		if err != nil {
			return Reply{}, err
		}
		rep.Clock, rep.HasClock = c, true
	}
	return rep, nil
}

// encodeClock encodes msgspec.msgpack.encode(float): always float64 (0xcb + 8 bytes big-endian).
func encodeClock(clock float64) ([]byte, error) {
	if math.IsNaN(clock) || math.IsInf(clock, 0) {
		return nil, invalid("clock frame", "", "clock must be finite, got %v", clock)
	}
	w := newWriter()
	w.float(clock)
	return w.bytes()
}

// decodeClock decodes the H4 clock frame (msgpack float; an int is accepted, as Python arithmetic would).
func decodeClock(b []byte) (float64, error) {
	r := newReader(b, "clock frame")
	f, err := r.number("")
	if err != nil {
		return 0, err
	}
	if err := r.end(); err != nil {
		return 0, err
	}
	return f, nil
}
