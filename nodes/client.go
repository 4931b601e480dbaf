package nodes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/ppnode/ppnode/job"
)

// Client is a client of one node's HTTP API (see the package
// documentation): the CLI, the demo, the nodes themselves (job records and
// cuts) and the tests use it. It is safe for concurrent use. Every call
// is bounded by its context.
type Client struct {
	addr   string
	scheme string // http, or https for a transport with TLS
	hc     *http.Client
}

// NewClient returns a client of the node whose HTTP API listens at addr
// (host:port).
func NewClient(addr string) *Client { return NewClientWith(addr, http.DefaultClient) }

// NewClientWith is NewClient with its own HTTP client (a transport of its
// own, a proxy). A transport with a TLS configuration ([HTTPClient])
// speaks https.
func NewClientWith(addr string, hc *http.Client) *Client {
	scheme := "http"
	if t, ok := hc.Transport.(*http.Transport); ok && t.TLSClientConfig != nil {
		scheme = "https"
	}
	return &Client{addr: addr, scheme: scheme, hc: hc}
}

// Addr is the node's HTTP address.
func (c *Client) Addr() string { return c.addr }

// maxAnswerBytes bounds a JSON answer (a 64-node cluster's status is a
// few hundred kB).
const maxAnswerBytes = 64 << 20

// APIError is an error answer of a node: its HTTP status and message.
type APIError struct {
	Code int
	Msg  string
}

func (e *APIError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Msg, e.Code) }

// IsNotFound reports whether err is a 404 answer.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == http.StatusNotFound
}

// specError is a 400 answer to a submission or a re-plan: it wraps the
// *APIError and job.ErrSpec.
type specError struct{ *APIError }

func (e specError) Unwrap() []error { return []error{e.APIError, job.ErrSpec} }

// Submit submits a job (POST /v1/jobs); the node plans it before it
// answers. A refused spec is an error wrapping job.ErrSpec.
func (c *Client) Submit(ctx context.Context, spec job.Spec) (SubmitReply, error) {
	var rep SubmitReply
	err := c.do(ctx, http.MethodPost, "/v1/jobs", spec, &rep)
	var ae *APIError
	if errors.As(err, &ae) && ae.Code == http.StatusBadRequest {
		err = specError{ae}
	}
	return rep, err
}

// Jobs returns the jobs the node coordinates (GET /v1/jobs).
func (c *Client) Jobs(ctx context.Context) ([]JobStatus, error) {
	var js []JobStatus
	return js, c.do(ctx, http.MethodGet, "/v1/jobs", nil, &js)
}

// Job returns a job the node coordinates (GET /v1/jobs/{id}).
func (c *Client) Job(ctx context.Context, id string) (JobStatus, error) {
	var st JobStatus
	return st, c.do(ctx, http.MethodGet, "/v1/jobs/"+id, nil, &st)
}

// Cancel stops a job the node coordinates (DELETE /v1/jobs/{id}).
func (c *Client) Cancel(ctx context.Context, id string) (JobStatus, error) {
	var st JobStatus
	return st, c.do(ctx, http.MethodDelete, "/v1/jobs/"+id, nil, &st)
}

// Replan asks the node to move a job it coordinates to another partition
// at its next step boundary (POST /v1/jobs/{id}/replan). A partition that
// does not fit the model or the nodes is an error wrapping job.ErrSpec.
func (c *Client) Replan(ctx context.Context, id string, r ReplanRequest) (JobStatus, error) {
	var st JobStatus
	err := c.do(ctx, http.MethodPost, "/v1/jobs/"+id+"/replan", r, &st)
	var ae *APIError
	if errors.As(err, &ae) && ae.Code == http.StatusBadRequest {
		err = specError{ae}
	}
	return st, err
}

// Status returns the node's view of itself and the cluster (GET
// /v1/status).
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	return st, c.do(ctx, http.MethodGet, "/v1/status", nil, &st)
}

// Record returns the record the node holds or sent of a job (GET
// /v1/jobrecords/{id}).
func (c *Client) Record(ctx context.Context, id string) (JobRecord, error) {
	var r JobRecord
	return r, c.do(ctx, http.MethodGet, "/v1/jobrecords/"+id, nil, &r)
}

// PutRecord gives the node a job's record (PUT /v1/jobrecords/{id}).
func (c *Client) PutRecord(ctx context.Context, rec JobRecord) error {
	return c.do(ctx, http.MethodPut, "/v1/jobrecords/"+rec.ID, rec, nil)
}

// Cuts lists the cuts of a job the node keeps (GET /v1/checkpoints/{job}).
func (c *Client) Cuts(ctx context.Context, jobID string) (CutList, error) {
	var l CutList
	return l, c.do(ctx, http.MethodGet, "/v1/checkpoints/"+jobID, nil, &l)
}

// Cut reads a cut's file as the node stores it, at most limit bytes (GET
// /v1/checkpoints/{job}/{step}); the caller verifies it.
func (c *Client) Cut(ctx context.Context, jobID string, step int64, limit int64) ([]byte, error) {
	res, err := c.send(ctx, http.MethodGet, "/v1/checkpoints/"+jobID+"/"+strconv.FormatInt(step, 10), "", nil)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("nodes: a cut over %d bytes", limit)
	}
	return b, nil
}

// PutCut sends a cut to the node (PUT /v1/checkpoints/{job}); write
// produces the file as it is sent.
func (c *Client) PutCut(ctx context.Context, jobID string, write func(io.Writer) error) error {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(write(pw)) }()
	defer pr.Close() // ends write if the request ends first
	res, err := c.send(ctx, http.MethodPut, "/v1/checkpoints/"+jobID, "application/octet-stream", pr)
	if err != nil {
		return err
	}
	res.Body.Close()
	return nil
}

// do sends in (JSON, if not nil) and decodes the answer into out (if not
// nil).
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	res, err := c.send(ctx, method, path, ct, body)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxAnswerBytes))
	if err != nil {
		return fmt.Errorf("%s %s://%s%s: %w", method, c.scheme, c.addr, path, err)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s://%s%s: bad answer: %w", method, c.scheme, c.addr, path, err)
	}
	return nil
}

// send sends a request and returns a 2xx answer; any other becomes an
// *APIError.
func (c *Client) send(ctx context.Context, method, path, contentType string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.scheme+"://"+c.addr+path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode/100 == 2 {
		return res, nil
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	msg := strings.TrimSpace(string(b))
	var e ErrorReply
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		msg = e.Error
	}
	if msg == "" {
		msg = res.Status
	}
	if strings.Contains(msg, "HTTP request to an HTTPS server") {
		msg = "the node at " + c.addr + " speaks TLS: give the cluster's credentials (--creds DIR or PPNODE_CREDS; see SECURITY.md)"
	}
	return nil, &APIError{Code: res.StatusCode, Msg: msg}
}
