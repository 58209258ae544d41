package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// HTTPTarget drives the demo-server's API: a write is POST /insert with
// {"user_id", "data"}, a read GET /get?user_id=. A write is acknowledged by a 200; a
// read finds its key on a 200 and misses on a 404. Any other status is a failure, a
// *StatusError.
type HTTPTarget struct {
	base   string
	client *http.Client
}

var (
	_ Target          = (*HTTPTarget)(nil)
	_ Replier         = (*HTTPTarget)(nil)
	_ ErrorClassifier = (*HTTPTarget)(nil)
)

// StatusError is an HTTP answer that is neither success nor a read's miss.
type StatusError struct {
	Status int
}

func (e *StatusError) Error() string { return fmt.Sprintf("server answered %d", e.Status) }

// NewHTTPClient returns a keep-alive client sized for concurrency connections.
func NewHTTPClient(concurrency int, timeout time.Duration) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        concurrency * 2,
		MaxIdleConnsPerHost: concurrency * 2,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &http.Client{Transport: tr, Timeout: timeout}
}

// NewHTTPTarget returns a target for the demo-server at baseURL (http:// or https://),
// sending through client (see NewHTTPClient), which the caller keeps.
func NewHTTPTarget(baseURL string, client *http.Client) (*HTTPTarget, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: target must be an http:// URL, got %q", ErrBadConfig, baseURL)
	}
	if client == nil {
		return nil, fmt.Errorf("%w: nil HTTP client", ErrBadConfig)
	}
	return &HTTPTarget{base: strings.TrimRight(baseURL, "/"), client: client}, nil
}

// Read implements Target.
func (t *HTTPTarget) Read(ctx context.Context, key string) (bool, error) {
	status, _, err := t.do(ctx, false, key, "", false)
	return readAnswer(status, err)
}

// Write implements Target.
func (t *HTTPTarget) Write(ctx context.Context, key, value string) error {
	status, _, err := t.do(ctx, true, key, value, false)
	return writeAnswer(status, err)
}

// ReadReply implements Replier: Read, keeping the status and the body.
func (t *HTTPTarget) ReadReply(ctx context.Context, key string) (bool, Reply, error) {
	status, body, err := t.do(ctx, false, key, "", true)
	found, err := readAnswer(status, err)
	return found, Reply{Status: status, Body: body}, err
}

// WriteReply implements Replier: Write, keeping the status and the body.
func (t *HTTPTarget) WriteReply(ctx context.Context, key, value string) (Reply, error) {
	status, body, err := t.do(ctx, true, key, value, true)
	return Reply{Status: status, Body: body}, writeAnswer(status, err)
}

// ClassifyError implements ErrorClassifier: "http_<status>" for a *StatusError, else
// ClassifyError's kinds.
func (t *HTTPTarget) ClassifyError(err error) string {
	var se *StatusError
	if errors.As(err, &se) {
		return fmt.Sprintf("http_%d", se.Status)
	}
	return ClassifyError(err)
}

func readAnswer(status int, err error) (bool, error) {
	switch {
	case err != nil:
		return false, err
	case status == http.StatusOK:
		return true, nil
	case status == http.StatusNotFound:
		return false, nil
	}
	return false, &StatusError{Status: status}
}

func writeAnswer(status int, err error) error {
	switch {
	case err != nil:
		return err
	case status == http.StatusOK:
		return nil
	}
	return &StatusError{Status: status}
}

// do sends one request and returns the status and, when keepBody is set, the body.
func (t *HTTPTarget) do(ctx context.Context, write bool, key, data string, keepBody bool) (int, []byte, error) {
	var req *http.Request
	var err error
	if write {
		body, _ := json.Marshal(struct {
			UserID string `json:"user_id"`
			Data   string `json:"data"`
		}{key, data})
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, t.base+"/insert", bytes.NewReader(body))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
		}
	} else {
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, t.base+"/get?user_id="+url.QueryEscape(key), nil)
	}
	if err != nil {
		return 0, nil, err
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var body []byte
	if keepBody {
		body, err = io.ReadAll(resp.Body)
	} else {
		_, err = io.Copy(io.Discard, resp.Body) // drain so the connection is reused
	}
	return resp.StatusCode, body, err
}
