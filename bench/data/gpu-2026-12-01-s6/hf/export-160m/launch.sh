#!/usr/bin/env bash
trainscout train --config /tmp/e160 --model pythia-160m --steps 1000  # or your own script: accelerate launch --config_file /tmp/e160/accelerate.yaml --num_processes 1 your_train.py, with TrainingArguments(**json.load(open('/tmp/e160/training_args.json')))
