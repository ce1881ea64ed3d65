"""tools.benchmarks.plot_call_cost: the
call-cost table and figure from benchmarks."""
import json

import pytest

from tools.benchmarks import plot_call_cost as call_cost


def _bench(path, ratios, step_ms, decoder_bytes):
  path.write_text(
      json.dumps({
          "target_cost_ratio_by_k": {
              str(k): v for k, v in ratios.items()
          },
          "target_ms_per_step": step_ms,
          "target_decoder_param_bytes_per_token": decoder_bytes
      }))
  return str(path)


def test_table_and_figure(tmp_path, capsys):
  small = _bench(tmp_path / "a.json", {1: 1.0, 4: 2.5}, 0.5, 24e6)
  big = _bench(tmp_path / "b.json", {1: 1.0, 2: 1.05, 4: 1.2}, 4.0, 117e6)
  out = str(tmp_path / "cc")
  assert call_cost.main(
      ["--bench", f"11M={small}", "--bench", f"38M={big}", "--out", out]) == 0
  table = (tmp_path / "cc.md").read_text()
  assert "| 11M | 24 MB | 0.50 ms | 1.00 | – | 2.50 |" in table
  assert "| 38M | 117 MB | 4.00 ms | 1.00 | 1.05 | 1.20 |" in table
  assert (tmp_path / "cc.png").read_bytes()[:4] == b"\x89PNG"
  assert table in capsys.readouterr().out


def test_bad_inputs_name_the_flag(tmp_path, capsys):
  with pytest.raises(SystemExit):
    call_cost.main(["--bench", "nolabel", "--out", str(tmp_path / "x")])
  assert "--bench must be LABEL=JSON_PATH, got 'nolabel'" in (
      capsys.readouterr().err)
  (tmp_path / "other.json").write_text("{}")
  with pytest.raises(SystemExit):
    call_cost.main([
        "--bench", f"a={tmp_path / 'other.json'}", "--out",
        str(tmp_path / "x")
    ])
  assert "no target_cost_ratio_by_k" in capsys.readouterr().err
  assert not (tmp_path / "x.md").exists()
