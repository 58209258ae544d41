package server

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/shardlab/shardlab/counters"
)

// counterIncrRequest is the body of POST /counter/incr. "by" defaults to 1.
type counterIncrRequest struct {
	Key *string `json:"key"`
	By  *int64  `json:"by"`
}

// counterResponse is the body of GET /counter.
type counterResponse struct {
	Key      string    `json:"key"`
	Count    int64     `json:"count"`
	LastSeen time.Time `json:"last_seen"`
}

// maxCounterBody bounds the body of POST /counter/incr.
const maxCounterBody = 4 << 10

func (s *Server) registerCounters() {
	s.handle("/counter/incr", http.MethodPost, s.counterIncr)
	s.handle("/counter", http.MethodGet, s.counterGet)
}

func (s *Server) counterIncr(w http.ResponseWriter, r *http.Request) int {
	var req counterIncrRequest
	if code := DecodeJSONBody(w, r, maxCounterBody, &req); code != 0 {
		return code
	}
	if req.Key == nil {
		return WriteError(w, http.StatusBadRequest, "key is required")
	}
	by := int64(1)
	if req.By != nil {
		by = *req.By
	}
	if err := counters.ValidateKey(*req.Key); err != nil {
		return WriteError(w, http.StatusBadRequest, err.Error())
	}
	if err := counters.ValidateBy(by); err != nil {
		return WriteError(w, http.StatusBadRequest, err.Error())
	}
	if err := s.cfg.Counter.Incr(r.Context(), *req.Key, by); err != nil {
		return s.counterFailure(w, r, err)
	}
	return WriteJSON(w, http.StatusOK, map[string]any{"key": *req.Key, "by": by, "status": "counted"})
}

func (s *Server) counterGet(w http.ResponseWriter, r *http.Request) int {
	q := r.URL.Query()
	keys, ok := q["key"]
	if !ok {
		return WriteError(w, http.StatusBadRequest, "query parameter key is required")
	}
	if len(keys) != 1 || len(q) != 1 {
		return WriteError(w, http.StatusBadRequest, "give exactly one query parameter: key")
	}
	if err := counters.ValidateKey(keys[0]); err != nil {
		return WriteError(w, http.StatusBadRequest, err.Error())
	}
	v, err := s.cfg.Counter.Get(r.Context(), keys[0])
	if errors.Is(err, counters.ErrNotFound) {
		return WriteJSON(w, http.StatusNotFound, map[string]any{"error": "key not found", "key": keys[0]})
	}
	if err != nil {
		return s.counterFailure(w, r, err)
	}
	return WriteJSON(w, http.StatusOK, counterResponse{Key: v.Key, Count: v.Count, LastSeen: v.LastSeen})
}

func (s *Server) counterFailure(w http.ResponseWriter, r *http.Request, err error) int {
	switch {
	case errors.Is(err, counters.ErrInvalidKey), errors.Is(err, counters.ErrInvalidBy):
		return WriteError(w, http.StatusBadRequest, err.Error())
	case r.Context().Err() != nil:
		return WriteError(w, 499, "request cancelled by the client")
	}
	s.stats.shardErrors.Add(1)
	return WriteError(w, http.StatusServiceUnavailable, fmt.Sprintf("counter store unavailable: %v", err))
}
