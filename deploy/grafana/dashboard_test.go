package grafana_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/deploy/grafana"
)

func TestQueries(t *testing.T) {
	tests := []struct {
		name    string
		dash    string
		want    []grafana.Query
		wantErr string
	}{
		{
			name: "panels, nested panels and variables",
			dash: `{"panels":[{"title":"R","type":"row","panels":[{"title":"A","type":"stat","targets":[{"refId":"A","expr":"a"}]}]},
				{"title":"B","type":"timeseries","targets":[{"refId":"A","expr":"b"},{"refId":"B","expr":"c"}]}],
				"templating":{"list":[{"name":"ds","type":"datasource","query":"prometheus"},
				{"name":"ns","type":"query","query":{"query":"label_values(x, namespace)"}},{"name":"pod","type":"query","query":"label_values(x, pod)"}]}}`,
			want: []grafana.Query{
				{Where: "panel A: A", Expr: "a"},
				{Where: "panel B: A", Expr: "b"},
				{Where: "panel B: B", Expr: "c"},
				{Where: "variable ns", Expr: "label_values(x, namespace)"},
				{Where: "variable pod", Expr: "label_values(x, pod)"},
			},
		},
		{name: "a panel without a query", dash: `{"panels":[{"title":"A","type":"stat"}]}`, wantErr: `panel "A" has no query`},
		{name: "a target without expr", dash: `{"panels":[{"title":"A","type":"stat","targets":[{"refId":"A"}]}]}`, wantErr: "target A has no expr"},
		{name: "a variable without a query", dash: `{"templating":{"list":[{"name":"v","type":"query","query":""}]}}`, wantErr: `variable "v" has no query`},
		{name: "not JSON", dash: `{`, wantErr: "dashboard"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := grafana.Queries([]byte(tc.dash))
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestTheShippedDashboardReads(t *testing.T) {
	qs, err := grafana.Queries(grafana.JSON)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(qs), 20)
}
