package synthesizer

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/traceops/trace/synthesizer/envserver"
)

// TestCatalogServesDoneEnvironments: the environment server, over the
// registry in ClickHouse, lists only DONE environments with the target's
// tool schemas and their calibration, and plays the stored program
// (sandboxed) through the OpenEnv HTTP API.
func TestCatalogServesDoneEnvironments(t *testing.T) {
	st := chStore(t)
	ctx := context.Background()
	done := sampleEnvironment()
	failed := sampleEnvironment()
	failed.ID, failed.TriggerID, failed.Status, failed.Calibration = "env-failed", "trig-failed", StatusFailed, nil
	for _, e := range []*Environment{done, failed} {
		if err := st.SaveEnvironment(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	cat := Catalog{Store: st}
	list, err := cat.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != done.ID || list[0].Source != "registry" || list[0].ProgramHash != done.ProgramHash {
		t.Fatalf("listed %+v, want only %s", list, done.ID)
	}
	// The listing carries the accepted calibration as it was recorded, not
	// zeros for what a list row lacks (seeds 0, std 0, no policy).
	var cal Calibration
	if err := json.Unmarshal(list[0].Calibration, &cal); err != nil || !reflect.DeepEqual(&cal, done.Calibration) {
		t.Errorf("listed calibration %s (%v), want %+v", list[0].Calibration, err, *done.Calibration)
	}
	for _, tool := range list[0].Tools {
		if tool.Function.Name != "get_reservation_details" && tool.Function.Name != "cancel_reservation" {
			t.Errorf("listed a tool the program does not use: %s", tool.Function.Name)
		}
	}
	if _, err := cat.Open(ctx, failed.ID); !errors.Is(err, envserver.ErrNotFound) {
		t.Errorf("Open(FAILED) = %v, want ErrNotFound", err)
	}
	if _, err := cat.Open(ctx, "env-nope"); !errors.Is(err, envserver.ErrNotFound) {
		t.Errorf("Open(unknown) = %v, want ErrNotFound", err)
	}

	srv, err := envserver.New(envserver.DefaultConfig(), envserver.Options{Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(ctx)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	get := func(method, path, body string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, method, hs.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("GET", "/v1/environments", ""); code != 200 || !strings.Contains(body, done.ID) || strings.Contains(body, failed.ID) {
		t.Errorf("GET /v1/environments = %d %s", code, body)
	}
	code, body := get("POST", "/v1/environments/"+done.ID+"/reset", `{"seed": 3}`)
	if code != 200 || !strings.Contains(body, `"observation"`) || !strings.Contains(body, `"done":false`) {
		t.Errorf("reset = %d %s", code, body)
	}
	if code, _ := get("POST", "/v1/environments/"+failed.ID+"/reset", `{"seed": 3}`); code != http.StatusNotFound {
		t.Errorf("reset of a FAILED environment = %d, want 404", code)
	}
}
