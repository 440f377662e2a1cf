"""What the foundation tests share: /metrics expositions modelled on real vLLM versions."""

from __future__ import annotations

# Modelled on a vLLM 0.10 exposition (v1 engine, data parallel size 2 behind one server).
CURRENT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2-7B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen2-7B"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen2-7B"} 1.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen2-7B"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen2-7B"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen2-7B"} 0.75
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen2-7B"} 100.0
vllm:prefix_cache_queries_total{engine="1",model_name="Qwen/Qwen2-7B"} 50.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen2-7B"} 40.0
vllm:prefix_cache_hits_total{engine="1",model_name="Qwen/Qwen2-7B"} 10.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="81541"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="81541"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="Qwen/Qwen2-7B"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="Qwen/Qwen2-7B"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen2-7B"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen2-7B"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen2-7B"} 7.5
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="Qwen/Qwen2-7B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="1.0",model_name="Qwen/Qwen2-7B"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="Qwen/Qwen2-7B"} 2.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="Qwen/Qwen2-7B"} 2.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="Qwen/Qwen2-7B"} 1.5
"""

# Modelled on a vLLM 0.8 exposition: the names vLLM 0.9 deprecated (0.9 and 0.10 expose
# them beside the current ones).
OLDER = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 200.0
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 120.0
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.05",model_name="m"} 10.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 0.3
"""
